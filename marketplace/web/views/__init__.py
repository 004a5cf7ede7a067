"""Views of the web marketplace, one module per audience. Views translate only: the work is
in the other apps' selectors and services, and in this app's small pure modules."""
