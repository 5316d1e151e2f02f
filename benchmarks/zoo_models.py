"""The models of the zoo (issue 41): Hugging Face models built from configs (random
weights, nothing downloaded) at sizes where a CPU step takes 10-200 ms, their inputs, and
the rows (model, mode) the zoo measures. ``ZOO`` is the zoo; ``BEYOND`` holds ten models it
does not, built at the same sizes, that check the zoo's results elsewhere (issue 41: "models
other than the zoo's are used to check this too"); ``MODELS`` is both.

``benchmarks/model_zoo.py`` measures them (``--models``, ``--beyond``).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import torch

MODES = ("train", "infer", "dynamic", "optimizer", "step", "checkpointed")
#: modes whose step computes a loss and its gradients
TRAINING = ("train", "step", "checkpointed")
SIDES = ("eager", "inductor", "torchloom")
VOCAB = 8192
TOKENS = 512  # tokens per step of the text models (batch 1)


# ---- the zoo -------------------------------------------------------------------------------
def _gpt2():
    import transformers as t
    return t.GPT2LMHeadModel(t.GPT2Config(n_layer=4, n_head=4, n_embd=256, vocab_size=VOCAB,
                                          n_positions=TOKENS, bos_token_id=0, eos_token_id=0))


def _decoder_config(config_class, **extra):
    return config_class(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                        vocab_size=VOCAB, max_position_embeddings=TOKENS, **extra)


def _decoder(class_name: str, config_name: str, **extra):
    """A builder of transformers' decoder ``class_name`` at the zoo's decoder sizes."""
    def build():
        import transformers as t
        return getattr(t, class_name)(_decoder_config(getattr(t, config_name), **extra))
    return build


_llama = _decoder("LlamaForCausalLM", "LlamaConfig", num_key_value_heads=2,
                  intermediate_size=704)
_qwen2 = _decoder("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=2,
                  intermediate_size=704)
_phi = _decoder("PhiForCausalLM", "PhiConfig", intermediate_size=1024,
                partial_rotary_factor=0.5)


def _bert():
    import transformers as t
    return t.BertForMaskedLM(t.BertConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
        vocab_size=VOCAB, max_position_embeddings=TOKENS))


def _t5():
    import transformers as t
    return t.T5ForConditionalGeneration(t.T5Config(
        d_model=256, d_kv=32, d_ff=1024, num_layers=4, num_decoder_layers=4, num_heads=8,
        vocab_size=VOCAB, decoder_start_token_id=0, pad_token_id=0))


#: the sizes of the ViT-like encoders (ViT; DeiT beyond the zoo)
VIT_SIZES = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4,
             "intermediate_size": 1024, "image_size": 224, "patch_size": 16, "num_labels": 10}


def _vit():
    import transformers as t
    return t.ViTForImageClassification(t.ViTConfig(**VIT_SIZES))


def _convnext():
    import transformers as t
    return t.ConvNextForImageClassification(t.ConvNextConfig(
        depths=[2, 2, 4, 2], hidden_sizes=[32, 64, 128, 256], image_size=IMAGE["convnext"],
        num_labels=10))


def _whisper_encoder():
    import transformers as t
    # the encoder (two convolutions over 80 mel bins, 4 layers) with a classification head
    return t.WhisperForAudioClassification(t.WhisperConfig(
        d_model=256, encoder_layers=4, encoder_attention_heads=4, encoder_ffn_dim=1024,
        decoder_layers=1, decoder_attention_heads=4, decoder_ffn_dim=256, num_mel_bins=80,
        max_source_positions=TOKENS, vocab_size=VOCAB, num_labels=10,
        classifier_proj_size=64, pad_token_id=0, bos_token_id=0, eos_token_id=0,
        decoder_start_token_id=0))


#: images per step and their side, per vision model
IMAGES = {"vit": 2, "convnext": 2}
IMAGE = {"vit": 224, "convnext": 224}


def _text(g: torch.Generator, length: int) -> dict:
    ids = torch.randint(1, VOCAB, (1, length), generator=g)
    return {"input_ids": ids, "labels": ids}


def _masked_text(g: torch.Generator, length: int) -> dict:
    batch = _text(g, length)
    mask = torch.ones(1, length, dtype=torch.long)
    mask[:, length - length // 8:] = 0  # a padded tail, as in a batch of unequal texts
    return {**batch, "attention_mask": mask}


def _seq2seq(g: torch.Generator, length: int) -> dict:
    target = torch.randint(1, VOCAB, (1, length // 4 + 1), generator=g)
    return {"input_ids": torch.randint(1, VOCAB, (1, length), generator=g),
            "decoder_input_ids": target[:, :-1], "labels": target[:, 1:]}


def _images(name: str):
    def batch(g: torch.Generator, length: int) -> dict:
        n, side = IMAGES[name], IMAGE[name]
        return {"pixel_values": torch.randn(n, 3, side, side, generator=g),
                "labels": torch.randint(0, 10, (n,), generator=g)}
    return batch


def _audio(g: torch.Generator, length: int) -> dict:
    # Whisper's encoder takes exactly 2 * max_source_positions mel frames
    return {"input_features": torch.randn(1, 80, 2 * TOKENS, generator=g),
            "labels": torch.randint(0, 10, (1,), generator=g)}


@attrs.frozen
class ZooModel:
    """A zoo entry: ``build()`` makes the model (random weights), ``batch(generator,
    length)`` one step's inputs with labels (dropped for inference); ``lengths``: the
    sequence lengths of its ``dynamic`` row, in the order they arrive (none: no such row)."""

    name: str
    title: str
    build: Callable[[], torch.nn.Module]
    batch: Callable[[torch.Generator, int], dict]
    lengths: tuple[int, ...] = ()


#: a server's mix of lengths: the first two compile (static, then symbolic), the rest reuse
SERVED_LENGTHS = (64, 320, 128, 512, 192, 448, 256, 384)

ZOO = {m.name: m for m in (
    ZooModel("gpt2", "GPT-2", _gpt2, _text, SERVED_LENGTHS),
    ZooModel("llama", "Llama (GQA)", _llama, _text, SERVED_LENGTHS),
    ZooModel("qwen2", "Qwen2 (GQA, qkv bias)", _qwen2, _text),
    ZooModel("phi", "Phi (partial rotary)", _phi, _text),
    ZooModel("bert", "BERT (MLM, padded)", _bert, _masked_text),
    ZooModel("t5", "T5 (encoder-decoder)", _t5, _seq2seq),
    ZooModel("vit", "ViT (224px)", _vit, _images("vit")),
    ZooModel("convnext", "ConvNeXt (224px)", _convnext, _images("convnext")),
    ZooModel("whisper", "Whisper encoder", _whisper_encoder, _audio),
)}


NOT_CHECKPOINTED = ("convnext",)  # (transformers gives it no activation checkpointing)


def rows(models, modes) -> list[tuple[str, str]]:
    """(model, mode) pairs that exist: a ``dynamic`` row only for models with lengths, a
    ``checkpointed`` one only for models that checkpoint (not ConvNeXt)."""
    return [(m, mode) for m in models for mode in modes
            if (mode != "dynamic" or MODELS[m].lengths)
            and (mode != "checkpointed" or m not in NOT_CHECKPOINTED)]

# ---- beyond the zoo: the same sizes, other architectures (session 65) ----------------------
def _opt():
    import transformers as t
    return t.OPTForCausalLM(t.OPTConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=8, ffn_dim=1024,
        vocab_size=VOCAB, max_position_embeddings=TOKENS, word_embed_proj_dim=256))


def _distilbert():
    import transformers as t
    return t.DistilBertForMaskedLM(t.DistilBertConfig(
        dim=256, n_layers=4, n_heads=4, hidden_dim=1024, vocab_size=VOCAB,
        max_position_embeddings=TOKENS))


def _roberta():
    import transformers as t
    return t.RobertaForMaskedLM(t.RobertaConfig(
        hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
        vocab_size=VOCAB, max_position_embeddings=TOKENS + 2))


def _bart():
    import transformers as t
    return t.BartForConditionalGeneration(t.BartConfig(
        d_model=256, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
        vocab_size=VOCAB, max_position_embeddings=TOKENS, pad_token_id=0,
        decoder_start_token_id=0, eos_token_id=2, bos_token_id=1))


def _deit():
    import transformers as t
    return t.DeiTForImageClassification(t.DeiTConfig(**VIT_SIZES))


def _swin():
    import transformers as t
    return t.SwinForImageClassification(t.SwinConfig(
        embed_dim=32, depths=[2, 2, 2], num_heads=[2, 4, 8], image_size=224, num_labels=10))


def _resnet():
    import transformers as t
    return t.ResNetForImageClassification(t.ResNetConfig(
        embedding_size=32, hidden_sizes=[32, 64, 128, 256], depths=[1, 1, 2, 1],
        num_labels=10))


BEYOND = {m.name: m for m in (
    ZooModel("mistral", "Mistral (GQA, sliding window)",
             _decoder("MistralForCausalLM", "MistralConfig", num_key_value_heads=2,
                      intermediate_size=704, sliding_window=256), _text),
    ZooModel("gemma", "Gemma", _decoder("GemmaForCausalLM", "GemmaConfig",
                                        num_key_value_heads=1, intermediate_size=704,
                                        head_dim=32), _text),
    ZooModel("gpt_neox", "GPT-NeoX", _decoder("GPTNeoXForCausalLM", "GPTNeoXConfig",
                                              intermediate_size=1024), _text),
    ZooModel("opt", "OPT", _opt, _text),
    ZooModel("distilbert", "DistilBERT", _distilbert, _masked_text),
    ZooModel("roberta", "RoBERTa", _roberta, _masked_text),
    ZooModel("bart", "BART", _bart, _seq2seq),
    ZooModel("deit", "DeiT", _deit, _images("vit")),
    ZooModel("swin", "Swin", _swin, _images("vit")),
    ZooModel("resnet", "ResNet", _resnet, _images("vit")),
)}
#: every model a row can name: the zoo's and those beyond it
MODELS = {**ZOO, **BEYOND}
