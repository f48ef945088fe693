#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff 7ee9ceb71e868944a46e1ff00b506772a53a4f1d
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout 7ee9ceb71e868944a46e1ff00b506772a53a4f1d tests/test_blueprints.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_blueprints.py b/tests/test_blueprints.py
index 1111111..2222222 100644
--- a/tests/test_blueprints.py
+++ b/tests/test_blueprints.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 

EOF_114329324912
: '>>>>> Start Test Output'
pytest -rA tests/test_blueprints.py
: '>>>>> End Test Output'
git checkout 7ee9ceb71e868944a46e1ff00b506772a53a4f1d tests/test_blueprints.py
