"""The sidebar pages of the Studio window, one module each."""
