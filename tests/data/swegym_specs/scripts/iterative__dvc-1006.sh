#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git diff 0606060606060606060606060606060606060606
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install --upgrade pip wheel GitPython; python -m pip install "cython<3.0.0" && python -m pip install --no-build-isolation pyyaml==5.4.1; python -m pip install git+https://github.com/iterative/mock-ssh-server.git || true; python -m pip install -r tests/requirements.txt || true; python -m pip install -r test-requirements.txt || true; python -m pip install -e ".[tests,dev,all_remotes,all,testing]";
git checkout 0606060606060606060606060606060606060606 tests/test_issue_6.py tests/data/case.json
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_issue_6.py b/tests/test_issue_6.py
--- a/tests/test_issue_6.py
+++ b/tests/test_issue_6.py
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
pytest -rA tests/test_issue_6.py
git checkout 0606060606060606060606060606060606060606 tests/test_issue_6.py tests/data/case.json
