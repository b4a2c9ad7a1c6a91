"""The full-size memory plan of a production job's ranks, built on the meta device (`prism-megatron plan`)."""
