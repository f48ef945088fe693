#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff 41d211c24a6781843b174379d6d6538f5c17adb9
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout 41d211c24a6781843b174379d6d6538f5c17adb9 testing/test_capture.py
git apply -v - <<'EOF_114329324912'
diff --git a/testing/test_capture.py b/testing/test_capture.py
index 1111111..2222222 100644
--- a/testing/test_capture.py
+++ b/testing/test_capture.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 

EOF_114329324912
: '>>>>> Start Test Output'
pytest -rA testing/test_capture.py
: '>>>>> End Test Output'
git checkout 41d211c24a6781843b174379d6d6538f5c17adb9 testing/test_capture.py
