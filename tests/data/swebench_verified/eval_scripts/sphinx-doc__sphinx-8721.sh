#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff 82ef497a8c88f0f6e50d84520e7276bfbf65025d
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .[test]
git checkout 82ef497a8c88f0f6e50d84520e7276bfbf65025d tests/test_ext_viewcode.py tests/roots/test-ext-viewcode/notes.txt
git apply -v - <<'EOF_114329324912'
diff --git a/tests/test_ext_viewcode.py b/tests/test_ext_viewcode.py
index 1111111..2222222 100644
--- a/tests/test_ext_viewcode.py
+++ b/tests/test_ext_viewcode.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 
diff --git a/tests/roots/test-ext-viewcode/notes.txt b/tests/roots/test-ext-viewcode/notes.txt
index 1111111..2222222 100644
--- a/tests/roots/test-ext-viewcode/notes.txt
+++ b/tests/roots/test-ext-viewcode/notes.txt
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+x
 

EOF_114329324912
: '>>>>> Start Test Output'
tox --current-env -epy39 -v -- tests/test_ext_viewcode.py
: '>>>>> End Test Output'
git checkout 82ef497a8c88f0f6e50d84520e7276bfbf65025d tests/test_ext_viewcode.py tests/roots/test-ext-viewcode/notes.txt
