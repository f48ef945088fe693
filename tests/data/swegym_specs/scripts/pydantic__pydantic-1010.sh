#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git diff 0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a
source /opt/miniconda3/bin/activate
conda activate testbed
export PATH="$HOME/.local/bin:$PATH"; pdm add pre-commit; make install;
git checkout 0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a tests/test_issue_10.py tests/data/case.json
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_issue_10.py b/tests/test_issue_10.py
--- a/tests/test_issue_10.py
+++ b/tests/test_issue_10.py
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
pytest -rA --tb=short -vv -o console_output_style=classic --no-header tests/test_issue_10.py
git checkout 0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a tests/test_issue_10.py tests/data/case.json
