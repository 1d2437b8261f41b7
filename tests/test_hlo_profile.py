"""Reading an optimized HLO module's operations into bytes per category (parallel.hlo_profile),
on a small hand-written module; the real compiled steps are checked in test_compile_report."""
import pytest

from bert_jax.parallel import hlo_profile

MODULE = """
HloModule jit_train_step

%fused_dot (p0: bf16[8,16], p1: bf16[16,32]) -> bf16[8,32] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[16,32]{1,0} parameter(1)
  ROOT %dot.1 = bf16[8,32]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%fused_ln (p0: f32[8,32]) -> f32[8] {
  %p0 = f32[8,32]{1,0} parameter(0)
  %c = f32[] constant(0)
  ROOT %r = f32[8]{0} reduce(%p0, %c), dimensions={1}, to_apply=%add
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %s = f32[] add(%a, %b)
}

ENTRY %main (param.0: bf16[8,16], param.1: bf16[16,32], param.2: f32[8,32]) -> f32[8,32] {
  %param.0 = bf16[8,16]{1,0} parameter(0), metadata={op_name="batch['x']"}
  %param.1 = bf16[16,32]{1,0} parameter(1)
  %param.2 = f32[8,32]{1,0} parameter(2)
  %fusion.1 = bf16[8,32]{1,0} fusion(%param.0, %param.1), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/intermediate/dense/dot_general"}
  %fusion.2 = f32[8]{0} fusion(%param.2), kind=kInput, calls=%fused_ln, metadata={op_name="jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_0/output/LayerNorm/reduce_sum"}
  %copy-start.1 = (f32[8,32]{1,0}, f32[8,32]{1,0:S(1)}, u32[]) copy-start(%param.2)
  %copy-done.1 = f32[8,32]{1,0:S(1)} copy-done(%copy-start.1)
  %all-reduce.1 = f32[8,32]{1,0} all-reduce(%copy-done.1), to_apply=%add
  %gte = f32[8]{0} get-tuple-element(%fusion.2), index=0
  ROOT %add.9 = f32[8,32]{1,0} add(%all-reduce.1, %param.2), metadata={op_name="jit(train_step)/optimizer_update/add"}
}
"""


def test_bytes_per_category_of_a_small_module():
  totals, top = hlo_profile.profile(MODULE, top=3)
  assert set(totals) == set(hlo_profile.CATEGORIES)
  assert totals["matmul"] == 8 * 16 * 2 + 16 * 32 * 2 + 8 * 32 * 2   # operands in, result out
  assert totals["layernorm_reduction"] == 8 * 32 * 4 + 8 * 4
  assert totals["copy_transpose"] == 2 * 8 * 32 * 4     # the async pair counted once
  assert totals["collective"] == 2 * 8 * 32 * 4
  assert totals["optimizer_update"] == 3 * 8 * 32 * 4
  assert totals["attention"] == totals["dropout_rng"] == totals["elementwise"] == 0
  assert [op["bytes"] for op in top] == sorted((op["bytes"] for op in top), reverse=True)
  assert top[0]["category"] == "optimizer_update"
  assert "intermediate/dense" in " ".join(op["name"] for op in
                                          hlo_profile.profile(MODULE, top=10)[1])


@pytest.mark.parametrize("path, category", [
    ("jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_3/attention/self/Dropout_0/lt",
     "dropout_rng"),
    ("jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_3/attention/self/softmax",
     "attention"),
    ("jit(train_step)/jvp(BertForPreTraining)/bert/encoder/layer_3/attention/self/query/add",
     "elementwise"),
])
def test_categories_follow_the_name_stack(path, category):
  op = hlo_profile.Operation("fusion.7", "fusion", "f32[4]", [], path, [])
  assert hlo_profile.categorize(op, {"add", "compare"}) == category


def test_shape_bytes():
  assert hlo_profile.shape_bytes("(f32[2,3]{1,0}, bf16[4]{0}, pred[])") == 24 + 8 + 1
  assert hlo_profile.shape_bytes("token[]") == 0


def test_the_bytes_of_vector_memory_are_those_of_buffers_in_memory_space_1():
  """The copy-done puts param.2 in S(1): the pair's result (its write) and the all-reduce's read
  of it are vector-memory bytes; nothing else of the module is."""
  assert hlo_profile.vector_memory_bytes(MODULE) == 2 * 8 * 32 * 4
  assert hlo_profile.shape_bytes("(f32[2,3]{1,0:S(1)}, bf16[4]{0})", 1) == 24
  assert hlo_profile.shape_bytes("(f32[2,3]{1,0:S(1)}, bf16[4]{0})", 0) == 8


SLICED = """
HloModule sliced

ENTRY %main (p: f32[8,32]) -> f32[4,32] {
  %p = f32[8,32]{1,0} parameter(0)
  %slice-start.1 = ((f32[8,32]{1,0}), f32[4,32]{1,0:S(1)}, s32[]) slice-start(%p), slice={[0:4], [0:32]}
  %slice-done.1 = f32[4,32]{1,0:S(1)} slice-done(%slice-start.1)
  ROOT %neg = f32[4,32]{1,0} negate(%slice-done.1)
}
"""


def test_a_slice_into_vector_memory_reads_hbm_and_writes_vector_memory():
  """The async slice reads 4 rows of the HBM parameter and writes them to S(1); the negate reads
  them there and writes HBM: half of each operation's bytes are vector memory."""
  totals, _ = hlo_profile.profile(SLICED)
  assert sum(totals.values()) == 4 * (4 * 32 * 4)
  assert hlo_profile.vector_memory_bytes(SLICED) == 2 * (4 * 32 * 4)


def test_the_collectives_of_a_small_module():
  gathered = MODULE.replace(
      "  ROOT %add.9", "  %all-gather.2 = f32[64,32]{1,0} all-gather(%param.2), dimensions={0}, "
      'metadata={op_name="jit(train_step)/jvp(embed)/gathered/all-gather"}\n  ROOT %add.9')
  found = hlo_profile.collectives(gathered)
  assert [(c["kind"], c["shape"], c["result_bytes"], c["count"]) for c in found] == [
      ("all-gather", "f32[64,32]", 64 * 32 * 4, 1), ("all-reduce", "f32[8,32]", 8 * 32 * 4, 1)]
  assert "gathered" in found[0]["name"] and not found[0]["in_loop"]


COLLECTIVE_MATMUL = """
HloModule collective_matmul

%fused_gather_dot (p0: bf16[8,16], p1: bf16[2,32]) -> bf16[8,32] {
  %p0 = bf16[8,16]{1,0} parameter(0)
  %p1 = bf16[2,32]{1,0} parameter(1)
  %ag = bf16[16,32]{1,0} all-gather(%p1), dimensions={0}
  ROOT %dot.1 = bf16[8,32]{1,0} dot(%p0, %ag), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (param.0: bf16[8,16], param.1: bf16[2,32]) -> bf16[8,32] {
  %param.0 = bf16[8,16]{1,0} parameter(0)
  %param.1 = bf16[2,32]{1,0} parameter(1)
  ROOT %fusion.1 = bf16[8,32]{1,0} fusion(%param.0, %param.1), kind=kOutput, calls=%fused_gather_dot, metadata={op_name="jit(train_step)/encoder/dense/dot_general"}
}
"""


def test_an_all_gather_fused_into_a_matmul_is_the_matmuls_bytes_and_still_a_collective():
  """libtpu fuses an all-gather into the matmul that reads it: the fusion's bytes are the
  matmul's (its operands and result), and `collectives` still lists the all-gather."""
  totals, _ = hlo_profile.profile(COLLECTIVE_MATMUL)
  assert totals["matmul"] == 8 * 16 * 2 + 2 * 32 * 2 + 8 * 32 * 2
  assert totals["collective"] == 0
  found = hlo_profile.collectives(COLLECTIVE_MATMUL)
  assert [(c["kind"], c["count"]) for c in found] == [("all-gather", 1)]
