"""The ``megatron`` trainer backend: megatron-core ``GPTModel`` actor and critic (see
docs/trainer.md "The megatron backend").

Importing this package does not import megatron-core (seconds of start-up); its modules do:
:mod:`~trainer.backends.megatron.model` (the model from a HF config, packed-lane forwards),
:mod:`~trainer.backends.megatron.convert` (HF <-> Megatron weights),
:mod:`~trainer.backends.megatron.cpu_compat` (the CUDA assumptions replaced on CPU),
:mod:`~trainer.backends.megatron.pipeline` (pipeline parallel through the 1F1B schedule),
:mod:`~trainer.backends.megatron.cp_layout` (context parallel: the chunks of a lane each rank
holds), :mod:`~trainer.backends.megatron.cp_attention` (the all-gather CP attention) and
:mod:`~trainer.backends.megatron.backend` (:class:`MegatronBackend`).
"""
