"""The architectures of ``model_survey.py``: tiny configs of Hugging Face models (random
weights, nothing downloaded), each with the way it is built and fed (``head``) and the two
sizes its inference stage runs at."""

from __future__ import annotations

import attrs

VOCAB = 128

_DECODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
_ENCODER = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=128)
_SEQ2SEQ = dict(vocab_size=VOCAB, d_model=64, encoder_layers=2, decoder_layers=2,
                encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                decoder_ffn_dim=128, max_position_embeddings=128, pad_token_id=0,
                decoder_start_token_id=0, eos_token_id=2, bos_token_id=1)
_SPEECH = dict(vocab_size=32, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
               intermediate_size=128, conv_dim=(32, 32), conv_stride=(4, 2),
               conv_kernel=(8, 4), num_conv_pos_embeddings=16,
               num_conv_pos_embedding_groups=4,
               mask_time_prob=0.0)  # no random masking in training
_VIT = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
            image_size=32, patch_size=8, num_labels=10)
_GPT2_STYLE = dict(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128)


@attrs.frozen
class Arch:
    """``model_type`` (a transformers config name), ``head`` (how it is built and fed:
    one of ``inputs``'s), ``config``: the tiny config's fields; ``sizes``: the first and
    second size of the inference stage (tokens, or images per batch, or pixels);
    ``cache``: the keyword a decoder is fed its cache under and returns it under
    (``past_key_values``; Mamba's state ``cache_params``; None: not decoded)."""

    model_type: str
    head: str
    config: dict
    sizes: tuple[int, int] = (16, 24)
    cache: str | None = "past_key_values"

    @property
    def decodes(self) -> bool:
        return self.head == "causal" and self.cache is not None


ARCHS = {a.model_type if n is None else n: a for n, a in (
    (None, Arch("llama", "causal", _DECODER)),
    (None, Arch("mistral", "causal", dict(_DECODER, sliding_window=8))),
    (None, Arch("qwen2", "causal", _DECODER)),
    (None, Arch("qwen3", "causal", dict(_DECODER, head_dim=16))),
    (None, Arch("phi", "causal", dict(_ENCODER, partial_rotary_factor=0.5))),
    (None, Arch("phi3", "causal", dict(_DECODER, pad_token_id=0))),
    (None, Arch("gemma", "causal", dict(_DECODER, head_dim=16))),
    (None, Arch("gemma2", "causal", dict(_DECODER, head_dim=16, sliding_window=8))),
    (None, Arch("gemma3_text", "causal", dict(_DECODER, head_dim=16, sliding_window=8))),
    (None, Arch("stablelm", "causal", _DECODER)),
    (None, Arch("olmo", "causal", _DECODER)),
    (None, Arch("mixtral", "causal", dict(_DECODER, num_local_experts=4,
                                          num_experts_per_tok=2))),
    (None, Arch("starcoder2", "causal", dict(_DECODER, sliding_window=8))),
    (None, Arch("granite", "causal", _DECODER)),
    (None, Arch("cohere", "causal", _DECODER)),
    (None, Arch("mamba", "causal", dict(vocab_size=VOCAB, hidden_size=64, state_size=8,
                                        num_hidden_layers=2, expand=2, conv_kernel=4),
                cache="cache_params")),  # a state space model: its cache is a state
    (None, Arch("xlnet", "causal", dict(vocab_size=VOCAB, d_model=64, n_layer=2, n_head=4,
                                        d_inner=128), cache=None)),  # (memories)
    (None, Arch("gpt_neox", "causal", dict(_ENCODER, rotary_pct=0.25))),
    (None, Arch("gpt2", "causal", _GPT2_STYLE)),
    (None, Arch("gptj", "causal", dict(_GPT2_STYLE, rotary_dim=8))),
    (None, Arch("codegen", "causal", dict(_GPT2_STYLE, rotary_dim=8, n_ctx=128))),
    (None, Arch("gpt_bigcode", "causal", dict(_GPT2_STYLE, multi_query=True))),
    (None, Arch("gpt_neo", "causal", dict(
        vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, window_size=8,
        attention_types=[[["global", "local"], 1]], max_position_embeddings=128))),
    (None, Arch("opt", "causal", dict(
        vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        ffn_dim=128, word_embed_proj_dim=64, max_position_embeddings=128))),
    (None, Arch("bloom", "causal", dict(vocab_size=VOCAB, hidden_size=64, n_layer=2,
                                        n_head=4))),
    (None, Arch("falcon", "causal", dict(vocab_size=VOCAB, hidden_size=64,
                                         num_hidden_layers=2, num_attention_heads=4))),
    (None, Arch("mpt", "causal", dict(vocab_size=VOCAB, d_model=64, n_heads=4, n_layers=2,
                                      expansion_ratio=2, max_seq_len=64))),
    (None, Arch("bert", "masked", _ENCODER)),
    (None, Arch("roberta", "masked", dict(_ENCODER, pad_token_id=0))),
    (None, Arch("electra", "masked", dict(_ENCODER, embedding_size=32))),
    (None, Arch("albert", "masked", dict(_ENCODER, embedding_size=32))),
    # (pos_att_type: disentangled attention, as the released models; without it the
    # relative embeddings' dropout is dead code, drawn by eager only)
    (None, Arch("deberta-v2", "masked", dict(_ENCODER, relative_attention=True,
                                             position_buckets=16,
                                             pos_att_type=["p2c", "c2p"]))),
    (None, Arch("distilbert", "masked", dict(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4,
                                             hidden_dim=128, max_position_embeddings=128))),
    (None, Arch("fnet", "masked", _ENCODER)),  # Fourier mixing: an FFT between real ops
    (None, Arch("modernbert", "masked", dict(_ENCODER, global_attn_every_n_layers=2,
                                             local_attention=8, pad_token_id=0))),
    (None, Arch("mobilebert", "masked", dict(_ENCODER, embedding_size=32,
                                             intra_bottleneck_size=32, true_hidden_size=32,
                                             num_feedforward_networks=2))),
    (None, Arch("funnel", "masked", dict(vocab_size=VOCAB, d_model=64, n_head=4, d_head=16,
                                         d_inner=128, block_sizes=[1, 1],
                                         num_decoder_layers=1))),
    (None, Arch("t5", "seq2seq", dict(vocab_size=VOCAB, d_model=64, d_kv=16, d_ff=128,
                                      num_layers=2, num_heads=4, decoder_start_token_id=0))),
    (None, Arch("bart", "seq2seq", _SEQ2SEQ)),
    (None, Arch("mbart", "seq2seq", _SEQ2SEQ)),
    (None, Arch("pegasus", "seq2seq", _SEQ2SEQ)),
    (None, Arch("marian", "seq2seq", _SEQ2SEQ)),
    (None, Arch("blenderbot", "seq2seq", _SEQ2SEQ)),
    (None, Arch("led", "seq2seq", dict(_SEQ2SEQ, max_encoder_position_embeddings=128,
                                       max_decoder_position_embeddings=128,
                                       attention_window=[8, 8]))),
    (None, Arch("whisper", "whisper", dict(_SEQ2SEQ, num_mel_bins=16,
                                           max_source_positions=32, max_target_positions=64))),
    (None, Arch("wav2vec2", "ctc", _SPEECH, (800, 1200))),
    (None, Arch("hubert", "ctc", _SPEECH, (800, 1200))),
    (None, Arch("wavlm", "ctc", dict(_SPEECH, num_buckets=32, max_bucket_distance=64),
                (800, 1200))),
    (None, Arch("vit", "image", _VIT, (2, 3))),
    (None, Arch("deit", "image", dict(_VIT, architectures=["DeiTForImageClassification"]),
                (2, 3))),
    (None, Arch("beit", "image", dict(_VIT, use_relative_position_bias=True), (2, 3))),
    (None, Arch("dinov2", "image", dict(_VIT, mlp_ratio=2), (2, 3))),
    (None, Arch("levit", "image", dict(image_size=64, hidden_sizes=[32, 48, 64],
                                       num_attention_heads=[1, 2, 2], depths=[1, 1, 1],
                                       key_dim=[8, 8, 8], num_labels=10,
                                       architectures=["LevitForImageClassification"]),
                (2, 3))),
    (None, Arch("swin", "image", dict(image_size=32, patch_size=2, embed_dim=16,
                                      depths=[1, 1], num_heads=[2, 4], window_size=4,
                                      num_labels=10), (2, 3))),
    (None, Arch("convnext", "pixels", dict(num_stages=2, depths=[1, 1],
                                           hidden_sizes=[16, 32], num_labels=10), (32, 48))),
    (None, Arch("resnet", "pixels", dict(embedding_size=16, hidden_sizes=[16, 32],
                                         depths=[1, 1], num_labels=10), (32, 48))),
    (None, Arch("regnet", "pixels", dict(embedding_size=16, hidden_sizes=[16, 32],
                                         depths=[1, 1], groups_width=8, num_labels=10),
                (32, 48))),
    (None, Arch("mobilenet_v2", "pixels", dict(image_size=32, depth_multiplier=0.35,
                                               num_labels=10), (32, 48))),
    (None, Arch("mobilevit", "pixels", dict(
        image_size=64, hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 16, 24, 32, 48, 64,
                                                                      80],
        num_labels=10), (64, 96))),
    (None, Arch("efficientnet", "pixels", dict(image_size=32, width_coefficient=0.25,
                                               depth_coefficient=0.25, hidden_dim=320,
                                               num_labels=10),
                (32, 48))),
    (None, Arch("segformer", "pixels", dict(num_encoder_blocks=2, depths=[1, 1],
                                            sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                            num_attention_heads=[1, 2],
                                            patch_sizes=[7, 3], strides=[4, 2],
                                            decoder_hidden_size=32, num_labels=10),
                (32, 48))),
    (None, Arch("clip", "clip", dict(
        text_config=dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4,
                         max_position_embeddings=64),
        vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, image_size=32, patch_size=8),
        projection_dim=16), (8, 12))),
)}
