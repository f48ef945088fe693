#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff a64cf2d5476e7bbda099b34c40b7be1880dbd39a
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout a64cf2d5476e7bbda099b34c40b7be1880dbd39a xarray/tests/test_dataset.py
git apply -v - <<'EOF_114329324912'
diff --git a/xarray/tests/test_dataset.py b/xarray/tests/test_dataset.py
index 1111111..2222222 100644
--- a/xarray/tests/test_dataset.py
+++ b/xarray/tests/test_dataset.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 

EOF_114329324912
: '>>>>> Start Test Output'
pytest -rA xarray/tests/test_dataset.py
: '>>>>> End Test Output'
git checkout a64cf2d5476e7bbda099b34c40b7be1880dbd39a xarray/tests/test_dataset.py
