"""megatron-core on CPU: quiet the import-time notes and deprecations that say nothing about prism."""


def pytest_configure(config):
    for line in (
        "ignore:Transformer Engine and Apex are not installed",
        "ignore:Apex is not installed",
        "ignore::DeprecationWarning:megatron",
        "ignore::FutureWarning:torch.distributed",
        "ignore:full scope is deprecated",
    ):
        config.addinivalue_line("filterwarnings", line)
