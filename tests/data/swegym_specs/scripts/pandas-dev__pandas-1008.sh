#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git diff 0808080808080808080808080808080808080808
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -ve . --no-build-isolation -Ceditable-verbose=true; pip uninstall pytest-qt -y;
git checkout 0808080808080808080808080808080808080808 tests/test_issue_8.py tests/data/case.json
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_issue_8.py b/tests/test_issue_8.py
--- a/tests/test_issue_8.py
+++ b/tests/test_issue_8.py
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
pytest -rA --tb=long tests/test_issue_8.py
git checkout 0808080808080808080808080808080808080808 tests/test_issue_8.py tests/data/case.json
