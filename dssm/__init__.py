"""dssm: learning search embeddings from click logs (Palangi et al. 2016, Wieting & Gimpel 2017)."""

__version__ = "0.1.0"
