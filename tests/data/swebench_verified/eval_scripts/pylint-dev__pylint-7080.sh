#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff 3c5eca2ded3dd2b59ebaf23eb289453b5d2930f0
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout 3c5eca2ded3dd2b59ebaf23eb289453b5d2930f0 tests/test_self.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_self.py b/tests/test_self.py
index 1111111..2222222 100644
--- a/tests/test_self.py
+++ b/tests/test_self.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 
diff --git a/tests/regrtest_data/directory/ignored_subdirectory/failing.py b/tests/regrtest_data/directory/ignored_subdirectory/failing.py
new file mode 100644
index 0000000..1111111
--- /dev/null
+++ b/tests/regrtest_data/directory/ignored_subdirectory/failing.py
@@ -0,0 +1,2 @@
+def test_added():
+    assert True
diff --git a/tests/regrtest_data/directory/data.json b/tests/regrtest_data/directory/data.json
new file mode 100644
index 0000000..1111111
--- /dev/null
+++ b/tests/regrtest_data/directory/data.json
@@ -0,0 +1,2 @@
+def test_added():
+{}

EOF_114329324912
: '>>>>> Start Test Output'
pytest -rA tests/test_self.py tests/regrtest_data/directory/ignored_subdirectory/failing.py
: '>>>>> End Test Output'
git checkout 3c5eca2ded3dd2b59ebaf23eb289453b5d2930f0 tests/test_self.py
