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

def pytest_configure(config):
    "The test run is a process entry point: it sets glibc's allocator once (Day 20), here and, by environment, in the kernels and servers it starts."
    import os
    from nanoserve.engine import keep_freed_memory, malloc_env
    keep_freed_memory()
    os.environ.update(malloc_env())
