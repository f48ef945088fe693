#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git diff 0000000000000000000000000000000000000000
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .; python -m pip install bokeh_sampledata;
git checkout 0000000000000000000000000000000000000000 tests/test_issue_0.py tests/data/case.json
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_issue_0.py b/tests/test_issue_0.py
--- a/tests/test_issue_0.py
+++ b/tests/test_issue_0.py
@@ -1,2 +1,4 @@
 import os
 
+def test_new():
+    assert os.sep
diff --git a/tests/data/case.json b/tests/data/case.json
--- a/tests/data/case.json
+++ b/tests/data/case.json
@@ -1 +1 @@
-{}
+{"a": 1}

EOF_114329324912
pytest -rA -n0 tests/test_issue_0.py
git checkout 0000000000000000000000000000000000000000 tests/test_issue_0.py tests/data/case.json
