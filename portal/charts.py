"""What every app's charts share: pygal's SVG made safe to serve as an image, and the policy serving it.

Charts are drawn on the server as SVG (pygal) and served by the portal itself: no script, no CDN, so they
work air-gapped.
"""

from __future__ import annotations

from xml.etree import ElementTree

# pygal styles its SVG inline; the image may load nothing and run nothing.
CHART_POLICY = {"default-src": ["'none'"], "script-src": ["'none'"], "style-src": ["'unsafe-inline'"]}


def without_scripts(tree: ElementTree.Element) -> bytes:
    """pygal writes its settings into a script for its tooltips; an image runs none, so none is sent
    (nor the comments, which carry the moment of drawing)."""
    for parent in tree.iter():
        for child in list(parent):
            if child.tag is ElementTree.Comment or str(child.tag).rsplit("}", 1)[-1] == "script":
                parent.remove(child)
    return ElementTree.tostring(tree, encoding="utf-8", xml_declaration=True)
