"""Sphinx + MyST-NB configuration of the kit's book (`make book`; book/build.py stages the sources).

Every notebook is rendered from its committed outputs: nothing is executed (nb_execution_mode "off"), nothing is
fetched at build time (no intersphinx) or when reading (no CDN scripts: MathJax is only loaded by pages with math,
and the kit's pages have none; ipywidgets' CDN bundle is off, so a widget shows its text form).
"""
import re

project = "kit"
author = "the kit's authors"
copyright = "the kit's authors, Apache-2.0"
root_doc = "index"

extensions = ["myst_nb"]
# Only what the book shows: the staged tree mirrors the repository (book/build.py), so relative links between the
# README, docs/ and notebooks/ (and to results/*.png) resolve as they do on a forge.
include_patterns = ["index.md", "README.md", "docs/*.md", "docs/benchmarks/*.md",
                    "notebooks/*.ipynb", "notebooks/appendix/*.ipynb", "notebooks/solutions/*.ipynb"]
exclude_patterns = ["**/.ipynb_checkpoints"]

# MyST: GitHub's heading slugs (README.md links docs/cluster.md#when-things-go-wrong), GitHub's tables and autolinks.
myst_heading_anchors = 4
myst_enable_extensions = ["strikethrough"]

# MyST-NB: the committed outputs, never executed; streams merged as JupyterLab shows them.
nb_execution_mode = "off"
nb_merge_streams = True
nb_render_markdown_format = "myst"          # text/markdown outputs (tables, bold) rendered as the notebook shows them
nb_ipywidgets_js = {}                       # no CDN: a widget output falls back to its text/plain form
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None),
                              ("html", "application/vnd.jupyter.widget-state+json", None)]
nb_output_stderr = "show"

html_theme = "sphinx_book_theme"
html_title = "kit: learn to make deep-learning training efficient, by measuring"
html_theme_options = {
    "show_toc_level": 2,
    "show_navbar_depth": 2,                 # docs/benchmarks/ open in the sidebar
    "home_page_in_toc": True,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "use_repository_button": False,
    "navigation_with_keys": False,
}
html_last_updated_fmt = None
# The theme's download button hands out the page's source: the notebook itself (.ipynb, outputs and all) or its .md.
html_copy_source = True
html_sourcelink_suffix = ""
html_show_sourcelink = False


# A Markdown link to a folder (README.md's `docs/benchmarks/`, which a forge shows as a listing) goes to that
# folder's index page, which book/build.py writes where the folder has none.
FOLDER_LINK = re.compile(r"\]\((?![a-z][a-z0-9+.-]*:)([^()\s#]*/)(#[^()\s]*)?\)")


def link_folders(app, docname, source):
    """Point Markdown links to a folder at its index.md."""
    if app.env.doc2path(docname).suffix == ".md":
        source[0] = FOLDER_LINK.sub(lambda m: f"]({m[1]}index.md{m[2] or ''})", source[0])


def setup(app):
    app.connect("source-read", link_folders)
