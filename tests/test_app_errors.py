"""Errors on the app's pages: what they quote from outside is shown as text (app/ui.py show_error)."""


def test_an_error_quoting_outside_text_renders_none_of_its_markdown():
    # an uploaded report whose name and content carry a link and emphasis: the error shows them as text
    from streamlit.testing.v1 import AppTest

    from app.ui import markdown_text

    shown = markdown_text("report [click](http://x.example) **bold** `code`.json")
    assert "[" not in shown.replace("\\[", "") and "**" not in shown.replace("\\*", "")
    at = AppTest.from_function(_error_page)
    at.run()
    assert not at.exception and at.error
    assert "](http" not in at.error[0].value.replace("\\]", "").replace("\\(", "")


def _error_page():
    from app.ui import show_error

    show_error("measurement report [x](http://evil.example) is not valid JSON")
