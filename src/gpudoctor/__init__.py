"""gpudoctor: why is my PyTorch GPU step slow, what does each cause cost, and what do I change.

Importing the package is cheap and changes nothing: torch is imported only by the parts that run code.
"""

__version__ = "0.1.0"
