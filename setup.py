"""Packaging hook: the wheel carries the course. pyproject.toml holds everything else.

``build_py`` copies the notebooks, exercises, figures, the shipped class run and JupyterLab's
settings into ``blockmem_lite/_course/`` of the wheel, by the globs ``blockmem_lite/course.py``
names (loaded here as a file: the package's own imports need torch, a build does not). An
editable install reads them from the checkout instead, so it copies nothing.
"""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def course_globs() -> tuple:
    spec = importlib.util.spec_from_file_location("_blockmem_course",
                                                  ROOT / "blockmem_lite" / "course.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.PACKAGED_FILES


class BuildPyWithCourse(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        target = Path(self.build_lib) / "blockmem_lite" / "_course"
        for pattern in course_globs():
            for source in sorted(ROOT.glob(pattern)):
                dest = target / source.relative_to(ROOT)
                self.mkpath(str(dest.parent))
                self.copy_file(str(source), str(dest))


setup(cmdclass={"build_py": BuildPyWithCourse})
