# Root conftest. The plugin itself loads through its pytest11 entry point.
# pytest_plugins may only be declared here (pytest 9 refuses it in a nested conftest, which
# broke every command typed from the repository root); pytester is for tests/plugin.
pytest_plugins = ["pytester"]
