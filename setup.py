"Packaging for nanoserve: every setting lives in settings.ini (nbdev 2's layout)."
from configparser import ConfigParser
import setuptools

cfg = ConfigParser(delimiters=['='])
cfg.read('settings.ini', encoding='utf-8')
cfg = cfg['DEFAULT']

def reqs(key):
    "The requirement list stored under `key` in settings.ini (space separated)."
    return cfg.get(key, '').split()

test_reqs = reqs('test_requirements')
setuptools.setup(
    name=cfg['lib_name'],
    version=cfg['version'],
    description=cfg['description'],
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    author=cfg['author'],
    author_email=cfg['author_email'],
    license='Apache-2.0',
    url=cfg['git_url'],
    python_requires='>=' + cfg['min_python'],
    packages=setuptools.find_packages(include=['nanoserve', 'nanoserve.*']),
    include_package_data=True,
    package_data={'nanoserve': ['kernels/*.c']},            # the C kernels, compiled on first use
    install_requires=reqs('requirements'),
    extras_require={'test': test_reqs, 'dev': test_reqs + reqs('dev_requirements')},
    entry_points={'console_scripts': cfg['console_scripts'].split(),
                  'nbdev': [f"{cfg['lib_name']}={cfg['lib_name']}._modidx:d"]},
    zip_safe=False,
)
