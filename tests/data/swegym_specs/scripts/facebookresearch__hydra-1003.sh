#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git diff 0303030303030303030303030303030303030303
source /opt/miniconda3/bin/activate
conda activate testbed
pip install -r requirements/dev.txt; pip install -e .;
git checkout 0303030303030303030303030303030303030303 tests/test_issue_3.py tests/data/case.json
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_issue_3.py b/tests/test_issue_3.py
--- a/tests/test_issue_3.py
+++ b/tests/test_issue_3.py
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
pytest -rA --tb=long tests/test_issue_3.py
git checkout 0303030303030303030303030303030303030303 tests/test_issue_3.py tests/data/case.json
