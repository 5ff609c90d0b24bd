"""The paper's language-modelling setup: a Transformer LM on lm1b, K = 4,
Adam (Gomez et al., 2022, Sec. 5.2)."""

from train import config as config_lib


def get_config():
  return config_lib.Config(
      model="transformer", dataset="lm1b", vocab_kind="wordpiece",
      vocab_size=32000, seq_len=256, num_layers=12, d_model=768, num_heads=12,
      mlp_dim=3072, strategy="2wise", num_modules=4, placement="tpu",
      optimizer="adam", learning_rate=3e-4, lr_schedule="cosine",
      warmup_steps=2000, batch_size=256, train_steps=100000,
      steps_per_loop=100, eval_every_steps=5000, eval_batches=100,
      checkpoint_every_steps=5000)
