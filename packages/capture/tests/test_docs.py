"""Every docstring example in ember.capture runs and prints what it shows."""


def test_docstring_examples(doctests):
    assert doctests("ember.capture") > 0
