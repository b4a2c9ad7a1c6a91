"""megatron-core on CPU: quiet the import-time notes about the missing Transformer Engine and apex."""


def pytest_configure(config):
    config.addinivalue_line("filterwarnings", "ignore:Transformer Engine and Apex are not installed")
    config.addinivalue_line("filterwarnings", "ignore:Apex is not installed")
