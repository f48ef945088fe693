#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff e4430f22c8e3d29ce5d9d0263fba57121938d06d
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout e4430f22c8e3d29ce5d9d0263fba57121938d06d tests/servers/tests.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/servers/tests.py b/tests/servers/tests.py
index 1111111..2222222 100644
--- a/tests/servers/tests.py
+++ b/tests/servers/tests.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 
diff --git a/tests/servers/test_liveserverthread.py b/tests/servers/test_liveserverthread.py
new file mode 100644
index 0000000..1111111
--- /dev/null
+++ b/tests/servers/test_liveserverthread.py
@@ -0,0 +1,2 @@
+def test_added():
+    assert True

EOF_114329324912
: '>>>>> Start Test Output'
./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 servers.tests servers.test_liveserverthread
: '>>>>> End Test Output'
git checkout e4430f22c8e3d29ce5d9d0263fba57121938d06d tests/servers/tests.py
