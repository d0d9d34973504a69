"""How good the int8 model is: the exact simulation of an exported file, evaluation against FP32, the accuracy budget and the HTML report."""
