"""gpudoctor's version, for the package (`gpudoctor.__version__`) and for what it writes (reports,
measurements): here, so that no module below the top level imports the package itself."""

__version__ = "0.1.0"
