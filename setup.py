"""Egg builds for ``scrapyd-deploy``, which runs ``setup.py bdist_egg`` (and
writes a setup.py of its own where there is none).

pyproject.toml holds all the packaging metadata; this file only sends the
build's intermediate files (build/, vertical.egg-info/) to a temporary
directory, so that deploying leaves nothing behind in the source tree.
"""

import atexit
import os
import shutil
import tempfile

from setuptools import setup

build_dir = tempfile.mkdtemp(prefix="vertical-build-")
atexit.register(shutil.rmtree, build_dir, ignore_errors=True)
# bdist_egg finds the metadata to copy by a path relative to this folder.
setup(options={"build": {"build_base": build_dir}, "egg_info": {"egg_base": os.path.relpath(build_dir)}})
