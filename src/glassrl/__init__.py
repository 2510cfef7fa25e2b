"""glassrl: RL post-training for language models that shows every number it computes, token by token.

The token convention every module follows is docs/token-convention.md: response tokens
y_0 … y_{T-1}, values[i] = V(s_i) read at the position before y_i, returns = raw advantages + values.
"""

__version__ = "0.1.0"
