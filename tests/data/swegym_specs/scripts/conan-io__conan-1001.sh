#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
export PYTHONPATH=${PYTHONPATH:-}:$(pwd)
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git diff 0101010101010101010101010101010101010101
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -r conans/requirements.txt; python -m pip install -r conans/requirements_server.txt; python -m pip install -r conans/requirements_dev.txt 
git checkout 0101010101010101010101010101010101010101 tests/test_issue_1.py tests/data/case.json
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_issue_1.py b/tests/test_issue_1.py
--- a/tests/test_issue_1.py
+++ b/tests/test_issue_1.py
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
pytest -n0 -rA tests/test_issue_1.py
git checkout 0101010101010101010101010101010101010101 tests/test_issue_1.py tests/data/case.json
