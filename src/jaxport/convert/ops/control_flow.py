"""Op rules: function calls, While, If and Case."""
