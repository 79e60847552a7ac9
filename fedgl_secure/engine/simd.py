"""A vector compare-and-movemask for numba kernels (``fused_knn``'s threshold scan).

numba's loop vectoriser does not turn "which of these 8 scores beat the bar?" into one compare
and a bit mask (its ``max`` and comparisons carry NaN semantics that block it), and a scalar scan
costs about 0.3 ns per score: as much as computing the score. ``above_mask`` emits the LLVM IR
directly: an unaligned 8 x float32 load, an ordered ``>`` against the splatted bar, and a bitcast
of the ``<8 x i1>`` result to an integer, which x86 lowers to ``vcmpps`` + ``vmovmskps`` (AVX)
and other targets to their equivalent. LLVM IR, not assembly: it compiles on any CPU numba does.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

# Scores per mask: one AVX register of float32.
LANES = 8


@intrinsic
def above_mask(typingctx, array, start, bar):  # pragma: no cover - compiled
    """Bit ``l`` set where ``array[start + l] > bar``, ``0 <= l < 8``.

    ``array`` is a contiguous float32 array with at least ``start + 8`` elements (not checked).
    """
    if not isinstance(array, types.Array) or array.dtype != types.float32:
        return None
    signature = types.uint32(array, start, types.float32)  # numba casts the bar to float32

    def codegen(context, builder, signature, args):
        array_value, start_value, bar_value = args
        view = context.make_array(signature.args[0])(context, builder, array_value)
        pointer = cgutils.get_item_pointer(context, builder, signature.args[0], view, [start_value])
        vector_type = ir.VectorType(ir.FloatType(), LANES)
        vector = builder.load(builder.bitcast(pointer, vector_type.as_pointer()), align=4, typ=vector_type)
        undefined = ir.Constant(vector_type, ir.Undefined)
        first = builder.insert_element(undefined, bar_value, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(first, undefined, ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES))
        bits = builder.bitcast(builder.fcmp_ordered(">", vector, splat), ir.IntType(LANES))
        return builder.zext(bits, ir.IntType(32))

    return signature, codegen
