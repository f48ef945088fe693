#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git diff 0909090909090909090909090909090909090909
source /opt/miniconda3/bin/activate
conda activate testbed
sed -i '/^git+https:\/\/github.com\/Project-MONAI\//d' requirements-dev.txt; python -m pip install types-pkg-resources==0.1.3 pytest; pip install -r requirements-dev.txt;python setup.py develop;
git checkout 0909090909090909090909090909090909090909 tests/test_issue_9.py tests/data/case.json
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_issue_9.py b/tests/test_issue_9.py
--- a/tests/test_issue_9.py
+++ b/tests/test_issue_9.py
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
pytest -rA  tests/test_issue_9.py
git checkout 0909090909090909090909090909090909090909 tests/test_issue_9.py tests/data/case.json
