"""Maps the top-level folders onto the `hone` namespace: app/ -> hone.app, core/ -> hone.core, ...

pyproject.toml holds everything else; setuptools cannot express "this folder is that package, with all
of its subpackages" declaratively, so the package list is computed here.
"""

from setuptools import find_namespace_packages, setup

FOLDERS = {"app": "hone.app", "core": "hone.core", "kernels": "hone.kernels", "resources": "hone.resources"}

packages = []
for folder, package in FOLDERS.items():
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])]

setup(packages=packages, package_dir={package: folder for folder, package in FOLDERS.items()})
