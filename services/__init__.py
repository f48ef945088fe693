"""Services shared by swerl's planes, and the composers that run the planes together.

Layer rule (enforced by ``tests/test_layers.py``, an AST walk that counts imports inside
functions and ``importlib.import_module`` with a literal name):

* The planes are ``adapter/``, ``sandbox_worker/`` and ``trainer/``. A plane imports no other
  plane; what two planes share lives in the base.
* The shared base is every module of ``services/`` except the composers: ``protocol/``,
  ``config.py``, ``cli.py``, ``queue/``, ``store/``, ``manager/``, ``datasets/``,
  ``weight_group.py``, ``hf_weights.py``, ``reference_engine/``, ``tiny_model/``,
  ``processes.py``, and the job API ``api/`` with the ``swerl_cli/`` (they drive rollouts through
  ``manager/`` only; a trainer service claims train jobs through ``api/claims.py``). It imports
  no plane.
* Composers start or combine planes: ``demo.py``, ``demo_objective.py``, ``local_stack.py``,
  the training runs on one machine ``toy_train.py`` and ``swe_train.py`` (and
  ``toy_train_job.py``: the toy run submitted through the job API), and the evaluation
  script ``eval/`` (grading in the sandbox plane driven from a CLI). They may
  import anything; nothing but a composer imports them (``swerl eval`` runs ``python -m
  services.eval`` as a child process, so the CLI in the base names it without importing it).
"""
