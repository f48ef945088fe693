"""``python -m adapter --engines URL[,URL...] --model DIR --redis URL --port P``.

Starts the OpenAI-compatible adapter (see docs/adapter.md). Flags override the ``adapter``
section of ``--config FILE`` / ``$SWERL_CONFIG`` and ``SWERL_ADAPTER__*`` environment variables.
"""

from __future__ import annotations

import argparse
import logging
import sys

from services.config import ConfigError, dump_config, load_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m adapter",
        description="OpenAI-compatible gateway that records token-exact trajectories.",
    )
    p.add_argument("--engines", help="comma-separated engine base URLs")
    p.add_argument("--model", help="model directory (tokenizer and chat template)")
    p.add_argument("--redis", dest="redis_url", help="Redis URL of the trajectory store")
    p.add_argument("--port", type=int)
    p.add_argument("--host")
    p.add_argument("--config", help="YAML configuration file (section 'adapter')")
    p.add_argument("--admin-token", dest="admin_token", help="bearer token for /admin routes")
    p.add_argument("--key-prefix", dest="key_prefix", help="Redis key prefix (default swerl:)")
    p.add_argument("--served-model-name", dest="served_model_name")
    p.add_argument("--log-level", dest="log_level")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    if "engines" in overrides:
        overrides["engines"] = [u for u in overrides["engines"].split(",") if u.strip()]
    try:
        config = load_config(
            _adapter_config_model(), section="adapter", path=args.config, overrides=overrides
        )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log = logging.getLogger("adapter")
    log.info("configuration:\n%s", dump_config(config))

    import uvicorn

    from adapter.app import create_app
    from adapter.rendering import Renderer
    from adapter.service import AdapterService
    from services.store import TrajectoryStore

    try:
        renderer = Renderer(
            config.model,
            chat_template_kwargs=config.chat_template_kwargs,
            end_of_turn=config.end_of_turn,
            context_length=config.context_length,
        )
    except (OSError, ValueError) as exc:
        print(f"error: cannot load the model's tokenizer: {exc}", file=sys.stderr)
        return 2
    store = TrajectoryStore.from_url(config.redis_url, config.key_prefix)
    service = AdapterService(config, renderer, store)
    app = create_app(service)
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        log_level=config.log_level.lower(),
        access_log=False,
        timeout_keep_alive=75,
    )
    return 0


def _adapter_config_model() -> type:
    from adapter.config import AdapterConfig

    return AdapterConfig


if __name__ == "__main__":
    raise SystemExit(main())
