"""Engine plug-ins: megamoe's drop-ins put into vLLM and SGLang through the engines' own
plug-in mechanisms, with no patched source files.

- :mod:`megamoe.plugins.vllm`: a vLLM general plug-in (entry point group
  ``vllm.general_plugins``, name ``megamoe``) that rebinds vLLM's
  ``prepare_megamoe_inputs``, ``stage_megamoe_routing`` and ``dsv4_topk_prepare_megamoe``
  to megamoe's drop-ins. On with ``MEGAMOE_VLLM_PLUGIN=1``.
- :mod:`megamoe.plugins.sglang`: an SGLang plug-in (group ``sglang.srt.plugins``) that
  registers a REPLACE hook on SGLang's MegaMoE pre-dispatch wrapper. On with
  ``MEGAMOE_SGLANG_PLUGIN=1``.

Both compare each target's signature (parameter names, order, kinds, defaults) with the one
recorded from the engine's sources and leave the engine untouched, with one warning, on any
difference or import failure. docs/PLUGINS.md describes them. Importing this package
imports nothing from either engine.
"""
