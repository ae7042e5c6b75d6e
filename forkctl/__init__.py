"""forkctl: the tool that keeps the vLLM fork as a patch series on a pinned base."""
