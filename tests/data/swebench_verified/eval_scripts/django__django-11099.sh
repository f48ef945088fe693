#!/bin/bash
set -uxo pipefail
source /opt/miniconda3/bin/activate
conda activate testbed
cd /testbed
sed -i '/en_US.UTF-8/s/^# //g' /etc/locale.gen && locale-gen
export LANG=en_US.UTF-8
export LANGUAGE=en_US:en
export LC_ALL=en_US.UTF-8
git config --global --add safe.directory /testbed
cd /testbed
git status
git show
git -c core.fileMode=false diff d26b2424437dabeeca94d7900b37d2df4410da0c
source /opt/miniconda3/bin/activate
conda activate testbed
python -m pip install -e .
git checkout d26b2424437dabeeca94d7900b37d2df4410da0c tests/auth_tests/test_validators.py
git apply -v - <<'EOF_114329324912'
diff --git a/tests/auth_tests/test_validators.py b/tests/auth_tests/test_validators.py
index 1111111..2222222 100644
--- a/tests/auth_tests/test_validators.py
+++ b/tests/auth_tests/test_validators.py
@@ -1,3 +1,5 @@
 import os
 
+def test_swerl_fixture():
+    assert True
 

EOF_114329324912
: '>>>>> Start Test Output'
./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 auth_tests.test_validators
: '>>>>> End Test Output'
git checkout d26b2424437dabeeca94d7900b37d2df4410da0c tests/auth_tests/test_validators.py
