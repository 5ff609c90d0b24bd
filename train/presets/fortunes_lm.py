"""Transformer LM on Debian's fortunes, K = 4, 2-wise, Adam (this machine)."""

from train import config as config_lib


def get_config():
  return config_lib.Config(
      model="transformer", dataset="fortunes", vocab_kind="wordpiece",
      vocab_size=2000, seq_len=64, num_layers=4, d_model=128, num_heads=4,
      mlp_dim=512, strategy="2wise", num_modules=4, placement="simulated",
      optimizer="adam", learning_rate=1e-3, lr_schedule="cosine",
      warmup_steps=50, batch_size=32, train_steps=1000, steps_per_loop=10,
      eval_every_steps=250, eval_batches=20, checkpoint_every_steps=250)
