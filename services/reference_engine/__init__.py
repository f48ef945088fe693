"""The reference engine: a CPU stand-in for SGLang that speaks SGLang's native HTTP protocol
(``services.protocol.sglang``) on a transformers model. Test and demo machinery, never deployed
in place of SGLang; ``python -m services.reference_engine.server --model DIR --port P``."""
