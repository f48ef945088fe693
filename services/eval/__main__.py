"""``python -m services.eval``: grade predictions like the official harness (docs/eval.md);
``python -m services.eval serve``: the evaluator service of the job API's eval jobs."""

import sys

if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        from services.eval.serve import main as serve_main

        sys.exit(serve_main(sys.argv[2:]))
    from services.eval.main import main

    sys.exit(main())
