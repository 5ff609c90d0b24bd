"""Transformer LM on Debian's fortunes, K = 4, 2-wise sum, Adam (this machine).

The "sum" variant (module k trained by L_k + L_{k+1}): with the released
"only" rule the first module's output collapses onto one direction on this
network and every head stays at the unigram perplexity for most of a run
(docs/results/study_fortunes_lm/: 352.5 against 171.7 with "sum" after 300
steps, 3 seeds).
"""

from train import config as config_lib


def get_config():
  return config_lib.Config(
      model="transformer", dataset="fortunes", vocab_kind="wordpiece",
      vocab_size=2000, seq_len=64, num_layers=4, d_model=128, num_heads=4,
      mlp_dim=512, strategy="2wise", variant="sum", num_modules=4,
      placement="simulated", optimizer="adam", learning_rate=1e-3,
      lr_schedule="cosine", warmup_steps=50, batch_size=32, train_steps=1000,
      steps_per_loop=10, eval_every_steps=250, eval_batches=20,
      checkpoint_every_steps=250)
