"""The coordinator: transcript encoder (hidden states, KV-prefix reuse, SVF), head, roles, episode."""
