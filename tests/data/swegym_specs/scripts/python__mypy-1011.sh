#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git diff 0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -r test-requirements.txt; python -m pip install -e .; hash -r
git checkout 0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b test-data/unit/check-basic.test
git apply -v - <<'EOF_114329324912'
diff --git a/test-data/unit/check-basic.test b/test-data/unit/check-basic.test
--- a/test-data/unit/check-basic.test
+++ b/test-data/unit/check-basic.test
@@ -1,3 +1,9 @@
 [case testEmptyFile]
 [out]
 
+[case testNewThing]
+x: int = ''
+[out]
+main:1: error: Incompatible types
+[case testOther]
+[out]

EOF_114329324912
pytest -rA -k "testEmptyFile or testNewThing or testOther"
git checkout 0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b0b test-data/unit/check-basic.test
