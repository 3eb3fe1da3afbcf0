"""Every JAX name beyond ``jax`` and ``jax.extend`` that hostcall uses.

Two kinds, gathered in this one package so that a JAX release that moves one
breaks here, loudly (``tests/test_jax_private.py`` checks each name), and
nowhere else:

* the interpreter APIs a primitive needs (``jax.interpreters`` and
  ``jax.core``): rule registries, symbolic zeros, abstract values, the
  MLIR helpers (``interpreters``);
* private names (``jax._src``), for what JAX's public API cannot say: a new
  side effect legal inside ``scan``/``while``/``cond``, ``custom_jvp`` and
  ``checkpoint``, JAX's io callback effects and the batching of a ``while``
  loop (``transforms``); the sharding JAX gives its own callbacks, a few
  sharding annotations and the key-value store of ``jax.distributed``'s
  coordination service (``sharding``); the partial evaluation rules that
  keep a host call where the user wrote it (``partial_eval``); runtime
  tokens and frames (``runtime``).

The rest of hostcall imports these names from here, never from the
modules.
"""

from jax._src.interpreters import partial_eval as _pe  # for tests' jaxprs

from hostcall._jax_private.interpreters import (ShapedArray, Tracer, Zero,
                                                UndefinedPrimal,
                                                is_undefined_primal,
                                                primitive_jvps,
                                                primitive_transposes,
                                                primitive_batchers,
                                                fancy_primitive_batchers,
                                                partial_eval_jaxpr_custom_rules,
                                                register_lowering, TokenSet,
                                                ir_constant, Effect,
                                                take_current_trace,
                                                aval_to_ir_types,
                                                HOST_CONSTANT_TYPES,
                                                emit_python_callback)
from hostcall._jax_private.sharding import (SPMDAxisContext, ShardingContext,
                                            callback_op_sharding, set_sharding,
                                            keep_with_executable,
                                            abstract_token, replicated,
                                            shard_alike, split_over_devices,
                                            require_devices_during_lowering,
                                            collective_axis_names,
                                            PMAP_DEFAULT_AXIS_NAME,
                                            is_unnamed_pmap_axis,
                                            device_assignment,
                                            distributed_client)
from hostcall._jax_private.transforms import (cache_weakly, debug_print_writer,
                                              flat_debug_callback,
                                              IO_EFFECT,
                                              ORDERED_IO_EFFECT,
                                              batch_jaxpr_axes, batch_jaxpr,
                                              NOT_REALLY_EFFECTS,
                                              io_callback_impl,
                                              is_ordered_effect, is_dropped,
                                              varying_axes, made_varying,
                                              broadcast_batched,
                                              register_effect, bind_equation,
                                              source_context_of,
                                              scan_layout, keep_when_unused,
                                              trace_of, is_top_level,
                                              dispatching_at_top_level)
from hostcall._jax_private.partial_eval import (keep_io_in_partial_evaluation,
                                                keep_calls_in_loop_bodies,
                                                restage_while_without,
                                                explain_checkpoint_refusal,
                                                is_recompute_policy)
from hostcall._jax_private.runtime import (wait_for_effects, on_effects_barrier,
                                           start_ordered_effects_afresh_after_a_failure,
                                           hide_frames_of, is_callback_frame,
                                           is_jax_frame, user_frame_of,
                                           loop_of_frame,
                                           is_loop_lowering_frame,
                                           debug_callback_on_cpu, placement_of)
