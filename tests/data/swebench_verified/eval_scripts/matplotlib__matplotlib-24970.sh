#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff a3011dfd1aaa2487cce8aa7369475533133ef777
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout a3011dfd1aaa2487cce8aa7369475533133ef777 lib/matplotlib/tests/test_colors.py
git apply -v - <<'EOF_114329324912'
diff --git a/lib/matplotlib/tests/test_colors.py b/lib/matplotlib/tests/test_colors.py
index 1111111..2222222 100644
--- a/lib/matplotlib/tests/test_colors.py
+++ b/lib/matplotlib/tests/test_colors.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 

EOF_114329324912
: '>>>>> Start Test Output'
pytest -rA lib/matplotlib/tests/test_colors.py
: '>>>>> End Test Output'
git checkout a3011dfd1aaa2487cce8aa7369475533133ef777 lib/matplotlib/tests/test_colors.py
