"""Small pieces of the OpenVINO backend, without a model: OpenVINO's attach rule as we
replicate it, and incremental detokenization."""

from __future__ import annotations

from engine.formats.openvino_ir import MatMulLayer, plan, split_name
from engine.runtime.openvino.backend import TextStream

Q0 = "__module.model.layers.0.self_attn.q_proj/aten::linear/MatMul"
Q10 = "__module.model.layers.10.self_attn.q_proj/aten::linear/MatMul"
LAYERS = (MatMulLayer(Q0, 576, 576), MatMulLayer(Q10, 576, 576),
          MatMulLayer("MatMul_65", None, None))


def pair(key: str, out_f: int = 576, in_f: int = 576, rank: int = 8) -> dict:
    return {f"{key}.lora_A.weight": (rank, in_f), f"{key}.lora_B.weight": (out_f, rank)}


def test_names_parse_the_way_openvino_parses_them() -> None:
    assert split_name("base_model.model.x.lora_A.weight") == ("A", "base_model.model.x")
    assert split_name("x_lora_up.weight") == ("B", "x")
    assert split_name("x.lora1.down.weight") == ("A", "x.lora1")
    assert split_name("x.lora_A.default.weight") is None  # PEFT's in-memory naming
    assert split_name("x.alpha") is None


def test_attach_plan_follows_openvino_substring_rule_and_checks_shapes() -> None:
    prefix = "base_model.model."
    result = plan({**pair(prefix + "model.layers.0.self_attn.q_proj"),
                   **pair(prefix + "model.layers.1.self_attn.q_proj")}, LAYERS)
    # layers.1 is not a substring of layers.10 ("layers.1.self" vs "layers.10.self").
    assert [(a.key, a.node) for a in result.attachments] == [
        ("model.layers.0.self_attn.q_proj", Q0)]
    assert (result.attached_tensors, result.total_tensors) == (2, 4)
    assert result.unused == tuple(sorted(pair(prefix + "model.layers.1.self_attn.q_proj")))
    # OpenVINO also tries the name with '.' replaced by '_'.
    underscored = plan(pair(prefix + "model_layers_10_self_attn_q_proj"), LAYERS)
    assert [a.node for a in underscored.attachments] == [Q10]
    # Keys without PEFT's prefix go nowhere (OpenVINO does not even warn about them).
    bare = plan(pair("model.layers.0.self_attn.q_proj"), LAYERS)
    assert bare.attached_tensors == 0 and not bare.ok and len(bare.unused) == 2
    # A tensor that lands on a layer of another shape is refused, with the shapes.
    wrong = plan(pair(prefix + "model.layers.0.self_attn.q_proj", out_f=192), LAYERS)
    assert not wrong.ok
    assert wrong.bad_shapes == ("model.layers.0.self_attn.q_proj: layer " + Q0
                                + " is 576x576, A [8, 576], B [192, 8]",)
    # A key short enough to hit several layers attaches to each of them.
    both = plan(pair(prefix + "self_attn.q_proj"), LAYERS)
    assert {a.node for a in both.attachments} == {Q0, Q10} and both.ok


def test_text_streams_whole_characters_only() -> None:
    pieces = {1: "Hé".encode(), 2: "🌊".encode()[:2], 3: "🌊".encode()[2:], 4: b" sea",
              5: b""}  # 5: a special token, which the detokenizer skips

    def decode(ids: list[int]) -> str:
        # Like OpenVINO's detokenizer: an incomplete UTF-8 sequence is dropped.
        return b"".join(pieces[i] for i in ids).decode("utf-8", "ignore")

    stream = TextStream(decode)
    emitted = [stream.feed(t) for t in (1, 2, 3, 5, 4)]
    assert emitted == ["Hé", "", "🌊", "", " sea"]
    assert stream.finish() == ""
    partial = TextStream(decode)
    assert [partial.feed(1), partial.feed(2)] == ["Hé", ""]
    assert partial.finish() == ""  # half a character is never emitted
