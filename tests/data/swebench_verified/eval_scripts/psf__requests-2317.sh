#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff 091991be0da19de9108dbe5e3752917fea3d7fdc
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install .
git checkout 091991be0da19de9108dbe5e3752917fea3d7fdc test_requests.py
git apply -v - <<'EOF_114329324912'
diff --git a/test_requests.py b/test_requests.py
index 1111111..2222222 100644
--- a/test_requests.py
+++ b/test_requests.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 

EOF_114329324912
: '>>>>> Start Test Output'
pytest -rA test_requests.py
: '>>>>> End Test Output'
git checkout 091991be0da19de9108dbe5e3752917fea3d7fdc test_requests.py
