#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff 54cab15bdacfaa05a88fbc5502a5b322d99f148e
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .[dev]
git checkout 54cab15bdacfaa05a88fbc5502a5b322d99f148e tests/_core/test_plot.py tests/_core/test_scales.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/_core/test_plot.py b/tests/_core/test_plot.py
index 1111111..2222222 100644
--- a/tests/_core/test_plot.py
+++ b/tests/_core/test_plot.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 
diff --git a/tests/_core/test_scales.py b/tests/_core/test_scales.py
index 1111111..2222222 100644
--- a/tests/_core/test_scales.py
+++ b/tests/_core/test_scales.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 

EOF_114329324912
: '>>>>> Start Test Output'
pytest --no-header -rA tests/_core/test_plot.py tests/_core/test_scales.py
: '>>>>> End Test Output'
git checkout 54cab15bdacfaa05a88fbc5502a5b322d99f148e tests/_core/test_plot.py tests/_core/test_scales.py
