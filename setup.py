"""Maps the top-level folders onto the `hone` namespace: app/ -> hone.app, core/ -> hone.core, ...

pyproject.toml holds everything else; setuptools cannot express "this folder is that package, with all
of its subpackages" declaratively, so the package list is computed here.

The top-level folders have no __init__.py, in the checkout and so in the wheel: hone.app, hone.core, hone.kernels
and hone.resources are namespace packages. Python and pytest put the checkout root first on sys.path, and a regular
package there would hide an installed distribution of the same name (transformers imports the `kernels`
distribution); a namespace portion never does. tests/test_checkout_shadowing.py holds this.
"""

from setuptools import find_namespace_packages, setup

FOLDERS = {"app": "hone.app", "core": "hone.core", "kernels": "hone.kernels", "resources": "hone.resources"}

packages = []
for folder, package in FOLDERS.items():
    packages.append(package)
    packages += [f"{package}.{sub}" for sub in find_namespace_packages(folder, exclude=["*__pycache__*"])]

setup(packages=packages, package_dir={package: folder for folder, package in FOLDERS.items()})
