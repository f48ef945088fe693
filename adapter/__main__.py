"""``python -m adapter --engines URL[,URL...] --model DIR --redis URL --port P``, or in relay
mode ``python -m adapter --upstream-url URL --upstream-model NAME --redis URL --port P``.

Starts the OpenAI-compatible adapter (see docs/adapter.md). Flags override the ``adapter``
section of ``--config FILE`` / ``$SWERL_CONFIG`` and ``SWERL_ADAPTER__*`` environment variables.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

from adapter.config import AdapterConfig
from services.cli import add_common_arguments, configure_logging, load_cli_config, service_parser
from services.config import dump_config

# Config keys set by flags of the same destination name (--redis sets redis_url).
_FLAG_KEYS = (
    "engines",
    "model",
    "redis_url",
    "port",
    "host",
    "admin_token",
    "key_prefix",
    "served_model_name",
)


def _parser() -> argparse.ArgumentParser:
    p = service_parser(
        "python -m adapter", "OpenAI-compatible gateway that records token-exact trajectories."
    )
    p.add_argument("--engines", help="comma-separated engine base URLs")
    p.add_argument("--model", help="model directory (tokenizer and chat template)")
    p.add_argument("--redis", dest="redis_url", help="Redis URL of the trajectory store")
    p.add_argument("--port", type=int, help="port to listen on (adapter.port, default 8100)")
    p.add_argument("--host", help="address to bind (adapter.host, default 127.0.0.1)")
    p.add_argument("--admin-token", dest="admin_token", help="bearer token for /admin routes")
    p.add_argument("--key-prefix", dest="key_prefix", help="Redis key prefix (default swerl:)")
    p.add_argument(
        "--served-model-name",
        dest="served_model_name",
        help="model id in /v1/models and responses (default: the model dir's name)",
    )
    relay = p.add_argument_group(
        "relay mode",
        "an OpenAI-compatible endpoint answers instead of engines; turns are recorded as text "
        "(no token ids or logprobs: for evaluation, not training; docs/adapter.md)",
    )
    relay.add_argument("--upstream-url", help="endpoint base URL up to /v1")
    relay.add_argument("--upstream-model", help="model name the endpoint is asked for")
    relay.add_argument(
        "--upstream-key-env", metavar="VAR", help="environment variable with its API key"
    )
    add_common_arguments(p, "adapter", log_levels=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = {key: getattr(args, key) for key in _FLAG_KEYS}
    if args.engines is not None:
        overrides["engines"] = [u for u in args.engines.split(",") if u.strip()]
    for flag, key in (("upstream_url", "url"), ("upstream_model", "model"),
                      ("upstream_key_env", "api_key_env")):  # fmt: skip
        overrides[f"upstream.{key}"] = getattr(args, flag)
    config = load_cli_config(AdapterConfig, "adapter", args, overrides)
    if isinstance(config, int):
        return config
    configure_logging(config.log_level)
    log = logging.getLogger("adapter")
    log.info("configuration:\n%s", dump_config(config))

    import uvicorn

    from adapter.app import create_app

    service = _relay_service(config) if config.relay else _engine_service(config)
    if isinstance(service, str):
        print(f"error: {service}", file=sys.stderr)
        return 2
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


def _engine_service(config: AdapterConfig) -> Any:
    """The engine-mode service (tokens through SGLang-protocol engines), or why not."""
    from adapter.lifecycle import open_store
    from adapter.rendering import Renderer
    from adapter.service import AdapterService

    try:
        renderer = Renderer(
            config.model,
            chat_template_kwargs=config.chat_template_kwargs,
            end_of_turn=config.end_of_turn,
            context_length=config.context_length,
            max_bytes_per_token=config.max_bytes_per_token,
        )
    except (OSError, ValueError) as exc:
        return f"cannot load the model's tokenizer: {exc}"
    return AdapterService(config, renderer, open_store(config))


def _relay_service(config: AdapterConfig) -> Any:
    """The relay-mode service (text through an OpenAI-compatible upstream), or why not."""
    from adapter.lifecycle import open_store
    from adapter.relay import RelayService, UpstreamClient

    assert config.upstream is not None
    try:
        client = UpstreamClient(config.upstream)
    except ValueError as exc:
        return str(exc)
    return RelayService(config, open_store(config), client)


if __name__ == "__main__":
    raise SystemExit(main())
