"pytest configuration shared by tests/ and the notebooks run under nbval."
import pytest

NOTEST_FLAGS = ('#| eval: false', '#|eval: false', '#| notest', '#|notest')

def pytest_collection_modifyitems(config, items):
    "Make nbdev-cleaned notebooks work under nbval: give saved outputs an execution count, skip eval:false cells."
    for item in items:
        cell = getattr(item, 'cell', None)
        if cell is None: continue
        if any(flag in cell.source for flag in NOTEST_FLAGS): item.add_marker(pytest.mark.skip(reason='nbdev: not run as a test'))
        if cell.get('execution_count') is None and cell.get('outputs'): cell['execution_count'] = 1
