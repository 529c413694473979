"""The architecture families `make compat` fine-tunes: each a named real checkpoint's config
class and the training-time settings it ships with (dropout, LayerDrop, SpecAugment, experts
and routing, sliding windows, soft-capping, rope scaling, tied embeddings, batch norm), with
only its sizes shrunk.

The settings below are read off each checkpoint's published `config.json`; where a family's
config class defaults to the checkpoint's value, it is not repeated. Token ids (padding, start,
end) are the tokenizer's each row trains with, not the checkpoint's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# -- tiny sizes, by the names each kind of config uses ---------------------------------------

ENCODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
               max_position_embeddings=160)
DECODER = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=8, intermediate_size=64,
               max_position_embeddings=256)
BART_LIKE = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                 max_position_embeddings=160)
T5_LIKE = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=4)
VISION = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
              image_size=32, patch_size=8)
AUDIO = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
             conv_dim=(32, 32, 32), conv_kernel=(10, 8, 4), conv_stride=(5, 4, 4),
             num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4,
             classifier_proj_size=32)
BERT_DROPOUT = dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)


@dataclass(frozen=True)
class Family:
    """One row of the table.

    Attributes:
        name: the family as people call it ("Llama 3.2").
        checkpoint: the real checkpoint whose settings the row ships.
        config: the transformers config class's name.
        task: `fine_tune`'s task.
        shipped: the checkpoint's training-time settings.
        sizes: the shrunk sizes (override nothing in `shipped` but sizes).
        lora: fine-tune LoRA adapters instead of every weight.
    """

    name: str
    checkpoint: str
    config: str
    task: str
    shipped: dict[str, Any] = field(default_factory=dict)
    sizes: dict[str, Any] = field(default_factory=dict)
    lora: bool = False

    @property
    def row(self) -> str:
        return self.name + (" + LoRA" if self.lora else "")


def _text(name, checkpoint, config, shipped=(), sizes=ENCODER, task="classification"):
    return Family(name, checkpoint, config, task, dict(shipped), dict(sizes))


def _lm(name, checkpoint, config, shipped=(), sizes=DECODER, lora=False):
    return Family(name, checkpoint, config, "causal-lm", dict(shipped), dict(sizes), lora)


ROBERTA = dict(BERT_DROPOUT, layer_norm_eps=1e-5)
DEBERTA_V3 = dict(BERT_DROPOUT, relative_attention=True, position_buckets=256,
                  norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
                  max_relative_positions=-1, position_biased_input=False, layer_norm_eps=1e-7)

FAMILIES: list[Family] = [
    # Encoders: sequence classification.
    _text("BERT", "google-bert/bert-base-uncased", "BertConfig", BERT_DROPOUT),
    _text("RoBERTa", "FacebookAI/roberta-base", "RobertaConfig", ROBERTA),
    _text("DistilBERT", "distilbert/distilbert-base-uncased", "DistilBertConfig",
          dict(dropout=0.1, attention_dropout=0.1, seq_classif_dropout=0.2,
               sinusoidal_pos_embds=False),
          dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=160)),
    _text("ALBERT", "albert/albert-base-v2", "AlbertConfig",
          dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
               classifier_dropout_prob=0.1, hidden_act="gelu_new"),
          dict(ENCODER, embedding_size=16)),
    _text("ELECTRA", "google/electra-base-discriminator", "ElectraConfig", BERT_DROPOUT,
          dict(ENCODER, embedding_size=32)),
    _text("DeBERTa-v2", "microsoft/deberta-v2-xlarge", "DebertaV2Config",
          dict(BERT_DROPOUT, relative_attention=True, position_buckets=256,
               norm_rel_ebd="layer_norm", share_att_key=True, pos_att_type=["p2c", "c2p"],
               conv_kernel_size=3, conv_act="gelu", max_relative_positions=-1,
               position_biased_input=False)),
    _text("DeBERTa-v3", "microsoft/deberta-v3-base", "DebertaV2Config", DEBERTA_V3),
    _text("XLM-RoBERTa", "FacebookAI/xlm-roberta-base", "XLMRobertaConfig", ROBERTA),
    _text("MPNet", "microsoft/mpnet-base", "MPNetConfig",
          dict(BERT_DROPOUT, relative_attention_num_buckets=32)),
    _text("ModernBERT", "answerdotai/ModernBERT-base", "ModernBertConfig",
          dict(global_attn_every_n_layers=3, local_attention=128, global_rope_theta=160000.0,
               local_rope_theta=10000.0, embedding_dropout=0.0, attention_dropout=0.0,
               mlp_dropout=0.0, classifier_pooling="mean"),
          dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4,
               intermediate_size=64, max_position_embeddings=160)),
    # Encoders: token classification and question answering.
    _text("BERT", "dslim/bert-base-NER", "BertConfig", BERT_DROPOUT,
          task="token-classification"),
    _text("RoBERTa", "FacebookAI/roberta-base", "RobertaConfig", ROBERTA,
          task="token-classification"),
    _text("DeBERTa-v3", "microsoft/deberta-v3-base", "DebertaV2Config", DEBERTA_V3,
          task="token-classification"),
    _text("BERT", "google-bert/bert-base-uncased", "BertConfig", BERT_DROPOUT,
          task="question-answering"),
    _text("RoBERTa", "deepset/roberta-base-squad2", "RobertaConfig", ROBERTA,
          task="question-answering"),
    _text("DistilBERT", "distilbert/distilbert-base-uncased", "DistilBertConfig",
          dict(dropout=0.1, attention_dropout=0.1, qa_dropout=0.1),
          dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64, max_position_embeddings=160),
          task="question-answering"),
    # Decoders.
    _lm("GPT-2", "openai-community/gpt2", "GPT2Config",
        dict(resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, tie_word_embeddings=True),
        dict(n_embd=32, n_layer=2, n_head=4, n_inner=64, n_positions=256)),
    _lm("OPT", "facebook/opt-125m", "OPTConfig",
        dict(dropout=0.1, attention_dropout=0.0, layerdrop=0.0, do_layer_norm_before=True,
             tie_word_embeddings=True),
        dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, ffn_dim=64,
             word_embed_proj_dim=32, max_position_embeddings=256)),
    _lm("Llama 3.2", "meta-llama/Llama-3.2-1B", "LlamaConfig",
        dict(rope_theta=500000.0, tie_word_embeddings=True,
             rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                               high_freq_factor=4.0, original_max_position_embeddings=8192))),
    _lm("Qwen2.5", "Qwen/Qwen2.5-0.5B", "Qwen2Config",
        dict(rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
             attention_dropout=0.0)),
    _lm("Qwen3", "Qwen/Qwen3-0.6B", "Qwen3Config",
        dict(rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False)),
    _lm("Gemma 2", "google/gemma-2-2b", "Gemma2Config",
        dict(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, sliding_window=16,
             query_pre_attn_scalar=8, hidden_activation="gelu_pytorch_tanh",
             tie_word_embeddings=True)),
    _lm("Gemma 3", "google/gemma-3-1b-pt", "Gemma3TextConfig",
        dict(sliding_window=16, query_pre_attn_scalar=8, rope_local_base_freq=10000.0,
             rope_theta=1000000.0, hidden_activation="gelu_pytorch_tanh",
             tie_word_embeddings=True)),
    _lm("Mistral", "mistralai/Mistral-7B-v0.1", "MistralConfig", dict(sliding_window=16)),
    _lm("Phi-3", "microsoft/Phi-3-mini-4k-instruct", "Phi3Config",
        dict(resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, sliding_window=16,
             tie_word_embeddings=False)),
    _lm("SmolLM2", "HuggingFaceTB/SmolLM2-135M", "LlamaConfig",
        dict(rope_theta=100000.0, tie_word_embeddings=True)),
    _lm("OLMo 2", "allenai/OLMo-2-0425-1B", "Olmo2Config",
        dict(rope_theta=500000.0, attention_dropout=0.0, tie_word_embeddings=False)),
    # Mixtures of experts.
    _lm("Mixtral", "mistralai/Mixtral-8x7B-v0.1", "MixtralConfig",
        dict(num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
             output_router_logits=True, sliding_window=None)),
    _lm("Qwen3-MoE", "Qwen/Qwen3-30B-A3B", "Qwen3MoeConfig",
        dict(num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
             router_aux_loss_coef=0.001, output_router_logits=True, decoder_sparse_step=1),
        dict(DECODER, moe_intermediate_size=32)),
    _lm("OLMoE", "allenai/OLMoE-1B-7B-0924", "OlmoeConfig",
        dict(num_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.01,
             output_router_logits=True, norm_topk_prob=False)),
    # LoRA on decoders.
    _lm("Llama 3.2", "meta-llama/Llama-3.2-1B", "LlamaConfig",
        dict(rope_theta=500000.0, tie_word_embeddings=True), lora=True),
    _lm("Qwen2.5", "Qwen/Qwen2.5-0.5B", "Qwen2Config",
        dict(rope_theta=1000000.0, tie_word_embeddings=True), lora=True),
    _lm("Mistral", "mistralai/Mistral-7B-v0.1", "MistralConfig", dict(sliding_window=16),
        lora=True),
    # LoRA on a mixture of experts (`lora=True`: adapters on every linear layer).
    _lm("Mixtral", "mistralai/Mixtral-8x7B-v0.1", "MixtralConfig",
        dict(num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
             output_router_logits=True, sliding_window=None), lora=True),
    # Encoder-decoders.
    Family("T5", "google-t5/t5-small", "T5Config", "seq2seq",
           dict(dropout_rate=0.1, feed_forward_proj="relu", tie_word_embeddings=True), T5_LIKE),
    Family("Flan-T5", "google/flan-t5-small", "T5Config", "seq2seq",
           dict(dropout_rate=0.1, feed_forward_proj="gated-gelu", tie_word_embeddings=False),
           T5_LIKE),
    Family("BART", "facebook/bart-base", "BartConfig", "seq2seq",
           dict(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1,
                encoder_layerdrop=0.0, decoder_layerdrop=0.0, scale_embedding=False),
           BART_LIKE),
    Family("mBART", "facebook/mbart-large-cc25", "MBartConfig", "seq2seq",
           dict(dropout=0.1, attention_dropout=0.1, scale_embedding=True), BART_LIKE),
    Family("M2M100", "facebook/m2m100_418M", "M2M100Config", "seq2seq",
           dict(dropout=0.1, attention_dropout=0.1, encoder_layerdrop=0.05,
                decoder_layerdrop=0.05, scale_embedding=True), BART_LIKE),
    Family("Marian", "Helsinki-NLP/opus-mt-en-de", "MarianConfig", "seq2seq",
           dict(dropout=0.1, attention_dropout=0.0, scale_embedding=True,
                share_encoder_decoder_embeddings=True), BART_LIKE),
    Family("Pegasus", "google/pegasus-xsum", "PegasusConfig", "seq2seq",
           dict(dropout=0.1, attention_dropout=0.1, scale_embedding=True), BART_LIKE),
    # Speech and audio.
    Family("Whisper", "openai/whisper-tiny", "WhisperConfig", "speech-recognition",
           dict(dropout=0.0, apply_spec_augment=False, encoder_layerdrop=0.0,
                decoder_layerdrop=0.0)),
    Family("wav2vec2", "facebook/wav2vec2-base", "Wav2Vec2Config", "audio-classification",
           dict(layerdrop=0.1, apply_spec_augment=True, mask_time_prob=0.05,
                mask_time_length=2, hidden_dropout=0.1, attention_dropout=0.1,
                feat_proj_dropout=0.1, final_dropout=0.0, feat_extract_norm="group"),
           AUDIO),
    Family("HuBERT", "facebook/hubert-base-ls960", "HubertConfig", "audio-classification",
           dict(layerdrop=0.1, apply_spec_augment=True, mask_time_prob=0.05,
                mask_time_length=2, hidden_dropout=0.1, attention_dropout=0.1,
                feat_proj_dropout=0.1, feat_extract_norm="group"),
           AUDIO),
    # Vision.
    Family("ViT", "google/vit-base-patch16-224", "ViTConfig", "image-classification",
           dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), VISION),
    Family("DeiT", "facebook/deit-base-patch16-224", "DeiTConfig", "image-classification",
           dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0), VISION),
    Family("Swin", "microsoft/swin-tiny-patch4-window7-224", "SwinConfig",
           "image-classification", dict(drop_path_rate=0.1, window_size=2),
           dict(image_size=32, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4])),
    Family("ConvNeXt", "facebook/convnext-tiny-224", "ConvNextConfig", "image-classification",
           dict(drop_path_rate=0.0, layer_scale_init_value=1e-6),
           dict(image_size=32, hidden_sizes=[16, 32], depths=[1, 1], num_stages=2)),
    Family("ResNet", "microsoft/resnet-50", "ResNetConfig", "image-classification",
           dict(layer_type="bottleneck", hidden_act="relu"),
           dict(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1])),
    Family("BEiT", "microsoft/beit-base-patch16-224", "BeitConfig", "image-classification",
           dict(use_relative_position_bias=True, layer_scale_init_value=0.1,
                use_mean_pooling=True, drop_path_rate=0.1), VISION),
]
